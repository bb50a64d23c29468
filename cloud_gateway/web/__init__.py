"""The gateway's status page (one self-contained HTML file: no external assets)."""
