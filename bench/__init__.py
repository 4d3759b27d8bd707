"""hangup's benchmarks and demos, in rooms by the question each answers (``bench/<room>/``), and
the harness they share with the tests (``bench/harness/``). ``python -m bench`` lists them all
(``bench/catalog.py``)."""
