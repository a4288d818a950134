-- The first model turn's entry says it proposed other calls; its stored hash and signature stay.
UPDATE entries SET raw = CAST(replace(CAST(raw AS TEXT), '"tool_calls":1', '"tool_calls":2') AS BLOB)
WHERE kind = 'model_turn' AND seq = 1;
