// node-redis multi().exec(): a transaction, and one aborted by a bad
// command. Usage: node node-redis.js host port
const { createClient } = require("redis");
const assert = require("node:assert");

(async () => {
  const r = createClient({ socket: { host: process.argv[2], port: Number(process.argv[3]), reconnectStrategy: false } });
  r.on("error", () => {});
  await r.connect();
  const args = ["nr", "3", "3600", "AT", "1000"];
  const got = await r.multi().addCommand(["RL.REDUCE", ...args]).addCommand(["RL.REDUCE", ...args]).exec();
  assert.deepStrictEqual(got, [3, 2]);
  await assert.rejects(
    r.multi().addCommand(["RL.REDUCE", "nr-abort", "3", "3600", "AT", "1000"]).addCommand(["NOPE"]).exec(),
    /EXECABORT|unknown command/,
  );
  assert.strictEqual(await r.sendCommand(["RL.GET", "nr-abort", "3", "3600", "AT", "1000"]), 3);
  assert.strictEqual(await r.sendCommand(["RL.GET", ...args]), 1);
  await r.quit();
  console.log("ok");
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
