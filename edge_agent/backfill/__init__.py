"""The agent's half of backfill (issue 17): learn what Prometheus scrapes through the relay,
scrape it locally while nobody asks, buffer the samples on disk and send them to the gateway
after reconnect. See docs/backfill.md."""
