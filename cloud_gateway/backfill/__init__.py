"""The gateway's half of backfill (issue 17): take agents' buffered scrapes from the backfill
stream, label them as Prometheus's scrape would, write them with remote write 1.0."""
