"""What the edge agent and the cloud gateway share for backfill (issue 17): the messages of
the backfill stream, sans-IO."""
