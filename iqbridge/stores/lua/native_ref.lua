-- Record where the broker keeps a message's payload (not a state change).
--
-- KEYS[1]  the message's record
-- ARGV[1]  the native reference
--
-- Returns 1, or 0 when there is no such message.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'n', ARGV[1])
return 1
