# Takes a token from each of a set of buckets, in passes, through redis-py's
# RedisCluster with its default retry settings, until stdin closes; prints
# "pass N" after each pass, and exits 1 on the first error that reaches
# the caller. Run by TestReplicatedClientsRideAFailover.
import sys, threading
from redis.cluster import RedisCluster, ClusterNode

ports = [int(p) for p in sys.argv[1].split(",")]
keys = ["client:%d" % i for i in range(int(sys.argv[2]))]
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in ports])
n = 0
while not stop.is_set():
    for k in keys:
        try:
            rc.execute_command("RL.REDUCE", k, 1000000, 3600, "AT", 1700000000)
        except Exception as e:
            print("error: %s: %r" % (k, e), flush=True)
            sys.exit(1)
    n += 1
    print("pass %d" % n, flush=True)
