"""`raven demo`: the whole product on loopback, with no external services."""
