"""What every room of ``bench/`` and the tests build on, and all the demos import: starting
hangup's real processes and reading them. ``processes`` (spawn one, its ready file, its process
tree, stopping it), ``waiting`` (the one polling loop), ``scrape`` (``/metrics`` as a scraper reads
it).

It ships in the image with the demos (``bench/demos/``), on hangup's base dependencies alone:
nothing here imports the test suite, the test extras or another room of ``bench/``
(``tests/tooling/test_demo_ships_alone.py`` holds this room and the Dockerfile to that).
Importing this package imports none of its modules.
"""
