# redis-py's default pipeline is a MULTI/EXEC transaction; run one, one
# with WATCH, and one aborted by a bad command. Usage: tx.py host port
import sys

import redis

r = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]))
args = ("py", 3, 3600, "AT", 1000)
p = r.pipeline()
p.execute_command("RL.REDUCE", *args)
p.execute_command("RL.REDUCE", *args)
got = p.execute()
assert got == [3, 2], got

with r.pipeline() as p:
    p.watch("py")
    n = p.execute_command("RL.GET", *args)
    p.multi()
    p.execute_command("RL.REDUCE", "py", 3, 3600, "TAKE", n, "AT", 1000)
    got = p.execute()
    assert got == [1], got

p = r.pipeline()
p.execute_command("RL.REDUCE", "py-abort", 3, 3600, "AT", 1000)
p.execute_command("NOPE")
try:
    p.execute()
    raise AssertionError("EXEC with an unknown command queued did not fail")
except redis.exceptions.ResponseError as e:
    assert "EXECABORT" in str(e) or "unknown command" in str(e), e
assert r.execute_command("RL.GET", "py-abort", 3, 3600, "AT", 1000) == 3
assert r.execute_command("RL.GET", *args) == 0
print("ok")
