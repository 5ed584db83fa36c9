// Takes a token from each of a set of buckets, in passes, through ioredis'
// Cluster, until stdin closes; prints "pass N" after each pass, and exits 1
// on the first error that reaches the caller. Run by
// TestReplicatedClientsRideAFailover. Its retry settings are the defaults
// but one: a call to a node that closed its connection is retried
// maxRedirections (16) times, retryDelayOnFailover apart, 100 ms by
// default, 1.6 s in all, which a failover at the default election timeout
// (1 to 2 s) can outlast; 250 ms gives it 4 s.
const Redis = require("ioredis");

const ports = process.argv[2].split(",").map(Number);
const keys = Array.from({ length: Number(process.argv[3]) }, (_, i) => "client:" + i);
let stop = false;
process.stdin.on("end", () => { stop = true; });
process.stdin.resume();
const rc = new Redis.Cluster(ports.map((port) => ({ host: "127.0.0.1", port })), { retryDelayOnFailover: 250 });

(async () => {
  for (let n = 1; !stop; n++) {
    for (const k of keys) {
      try {
        await rc.call("RL.REDUCE", k, 1000000, 3600, "AT", 1700000000);
      } catch (e) {
        console.log("error: " + k + ": " + e);
        process.exit(1);
      }
    }
    console.log("pass " + n);
  }
  rc.disconnect();
  process.exit(0);
})();
