"""PrefixOps' simulated prefix-cached engine: block pool, vLLM V1 scheduler, workloads, experiments.

Run ``python -m simulator --help``. The engine model lives in ``engine.py`` and
``pool.py``; the live HTTP server in ``server.py``; offline runs and the
experiments in ``offline.py`` and ``experiments.py``.
"""
