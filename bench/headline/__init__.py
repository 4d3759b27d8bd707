"""The headline: what hang-ups cost the clients who stay, and what hangup gives back, measured
with the real AIPerf on the real engine; ``python -m bench.headline`` runs it and draws the charts
(``docs/headline.md``)."""
