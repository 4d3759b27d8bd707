"""How both processes are run, and what they tell the people who run them: one option table per
process built the same way from flags and ``HANGUP_<PROCESS>_*`` variables (:mod:`.options`),
one JSON log line shape (:mod:`.logs`), one ready file and one way to read a secret file
(:mod:`.files`). The Helm chart, runbooks and log pipelines rely on these being the same in the
gateway and the proxy."""
