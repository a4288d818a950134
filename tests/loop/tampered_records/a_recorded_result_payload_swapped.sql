-- Every recorded tool result's payload says something else; the entries that name it are untouched.
UPDATE blobs SET data = CAST('{"content":[{"type":"text","text":"forged"}],"isError":false}' AS BLOB)
WHERE ref IN (SELECT ref FROM session_blobs) AND CAST(data AS TEXT) LIKE '%read a%';
