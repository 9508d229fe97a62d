"""Self-healing: detectors, incidents, playbooks, guardrails, journal, actions (see PLAYBOOKS.md)."""
