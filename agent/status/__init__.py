"""The status page: its HTTP side (http), the view it shows (view), other nodes read from their agents (peers),
and the page's own files (index.html, status.js, status.css, icon.svg), served as they are."""
