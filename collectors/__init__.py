"""Collectors: scrape engines and sidecars into the PrefixOps database; evaluate alerts (see service.py)."""
