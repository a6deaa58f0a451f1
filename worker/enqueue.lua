-- Atomic enqueue of one agent task as an rq job (docs/contract.md, "Tasks").
--
-- KEYS[1]   the job hash                 rq:job:<task_id>
-- KEYS[2]   the queue list               rq:queue:<queue>
-- KEYS[3]   the set of known queues      rq:queues
-- KEYS[4]   the scheduled registry       rq:scheduled:<queue>
-- KEYS[5..] registries a finished run leaves when the task is written again
--           (finished, failed, canceled)
-- ARGV[1]   the job id
-- ARGV[2]   "front", "back" or "scheduled"
-- ARGV[3]   when "scheduled": the unix time it becomes due (rq's score)
-- ARGV[4]   the queue key, as rq registers it in rq:queues
-- ARGV[5]   "rerun" to run again a task id that already ran (finished, failed, stopped or
--           canceled, its job hash still kept); anything else ("") leaves such a task alone.
--           Optional: the job hash's fields come in pairs, so an odd count of arguments after
--           ARGV[4] says ARGV[5] is this flag; an even count is the earlier layout without it.
-- ARGV[6..] field, value, ... of the job hash, exactly as rq's Job.to_dict() writes them
--           (ARGV[5..] in the earlier layout)
--
-- Returns 0 when the task is already waiting or running (nothing is touched),
-- 1 when it was pushed on the queue, 2 when it was put in the scheduled registry,
-- 3 when it already ran and ARGV[5] is not "rerun" (nothing is touched: its result stays).

local first_field = 5
local rerun = false
if (#ARGV - 4) % 2 == 1 then
    rerun = ARGV[5] == 'rerun'
    first_field = 6
end

local status = redis.call('HGET', KEYS[1], 'status')
if status == 'queued' or status == 'started' or status == 'scheduled' or status == 'deferred' then
    return 0
end
if status and not rerun then
    return 3
end

-- A finished, failed or canceled run of the same task id leaves no stale field behind.
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, first_field))
for index = 5, #KEYS do
    redis.call('ZREM', KEYS[index], ARGV[1])
end
redis.call('SADD', KEYS[3], ARGV[4])

if ARGV[2] == 'scheduled' then
    redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
    return 2
elseif ARGV[2] == 'front' then
    redis.call('LPUSH', KEYS[2], ARGV[1])
else
    redis.call('RPUSH', KEYS[2], ARGV[1])
end
return 1
