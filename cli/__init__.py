"""The ``truss`` command-line front end (installed as ``truss_cli``): parse, call ``truss``, render.

Thin by design: no decisions live here. Commands that connect to servers import the MCP tier
lazily, so ``truss --help`` and the ledger and contract commands never load the ``mcp`` SDK.
"""
