"""Several hangup pods behind a real Envoy: what each pod did with a burst of calls half hanging
up, and what an Endpoint Picker's scrape of every pod costs.

``pods`` is the benchmark; with its defaults it is also ``make demo-scale``."""
