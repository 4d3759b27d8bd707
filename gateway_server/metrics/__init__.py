"""The gateway's Prometheus metrics: every series (:mod:`.gateway`), the Endpoint Picker's
gauges (:mod:`.pool`), and a stream's tokens added in batches (:mod:`.token_books`)."""
