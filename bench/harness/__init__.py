"""What the demos and benchmarks run hangup with (processes, waiting, scraping): it ships with
``bench/`` in the image, which the test suite does not."""
