-- A fixed window the way Redis-backed middlewares count one (the Go
-- ulule/limiter v3 store and the Node rate-limit-redis store both send a
-- script of this shape): add the cost to the window's counter, give the
-- counter a TTL when this call created it, and return the count with the
-- time left, for the X-RateLimit-* headers.
--
-- KEYS[1] the window's counter, e.g. ratelimit/{id}/{window start}
-- ARGV[1] cost, ARGV[2] window in ms
local used = redis.call('INCRBY', KEYS[1], ARGV[1])
if used == tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {used, redis.call('PTTL', KEYS[1])}
