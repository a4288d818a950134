-- The first call's intent is removed from the chain, as if it had never been sent.
DELETE FROM entries WHERE kind = 'mcp_tool_intent' AND seq = (SELECT min(seq) FROM entries WHERE kind = 'mcp_tool_intent');
