// ioredis multi().exec(): a transaction, and one aborted by a bad command.
// Usage: node ioredis.js host port
const Redis = require("ioredis");
const assert = require("node:assert");

(async () => {
  const r = new Redis({ host: process.argv[2], port: Number(process.argv[3]), maxRetriesPerRequest: 0 });
  const args = ["io", 3, 3600, "AT", 1000];
  const got = await r.multi().call("RL.REDUCE", ...args).call("RL.REDUCE", ...args).exec();
  assert.deepStrictEqual(got, [[null, 3], [null, 2]]);
  await assert.rejects(
    r.multi().call("RL.REDUCE", "io-abort", 3, 3600, "AT", 1000).call("NOPE").exec(),
    /EXECABORT/,
  );
  assert.strictEqual(await r.call("RL.GET", "io-abort", 3, 3600, "AT", 1000), 3);
  assert.strictEqual(await r.call("RL.GET", ...args), 1);
  r.disconnect();
  console.log("ok");
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
