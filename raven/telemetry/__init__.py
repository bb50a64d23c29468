"""What every process says about itself: structured logs, its Prometheus metrics and their
exposition, the status document as terminal tables. (Nothing imported here: each module is
imported where it is used, so a plain agent loads only what it needs.)"""
