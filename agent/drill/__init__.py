"""The fault drill (`supernode-agent drill PLAN`): a synthetic fault the agent handles as a real one, proven.

Why its own package: the drill is not remediation; it feeds remediation the way a device does (`source.py`:
readings in the snapshot), watches what the engine does (`runner.py`, each node's `part.py`), and judges it
against a plan (`plan.py`) in a report (`report.py`). A zone's drill reaches every agent of the zone through rack
coordination as a signed announcement (`rack.py`, `records.py`), and each joins it on its own node
(`follower.py`). Remediation only knows that an incident whose detail says `drill: true`
keeps its destructive steps dry-run unless the plan says otherwise.
"""
