-- Record where the broker keeps messages' payloads (not a state change).
--
-- KEYS     the messages' records
-- ARGV     their native references, in the same order
--
-- Returns how many of the messages exist (and were written); unknown ones are skipped.

local found = 0
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, 'n', ARGV[i])
    found = found + 1
  end
end
return found
