"""What the end-to-end tests (tests/e2e/) are built from: network namespaces, veth pairs and
processes in them (netns), packet capture, nginx, Prometheus, the backfill lab."""
