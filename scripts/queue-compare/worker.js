// graphile-worker's side of the queue comparison (scripts/queue-compare.sh): the bench
// (`cargo bench --bench comparison -- --scenario burndown --system graphile`) runs this file
// twice — `prepare` before its measurement starts, `run` as the measured worker.
//
//   node worker.js prepare   installs graphile-worker's schema and adds EVENTS jobs
//                            (addJobs, 5 000 a call), then exits
//   node worker.js run       works the jobs until SIGTERM (graceful: running jobs finish,
//                            batched completions are written, locked jobs are returned)
//
// Environment: DATABASE_URL; EVENTS (prepare, default 50000); TARGET_URL, CONCURRENCY
// (default 32), LOCAL_QUEUE (default 500) for run. The task POSTs the job's payload to
// TARGET_URL with the headers hookgate sends (Idempotency-Key `bench:<id>`,
// Hookgate-Attempt), on a keep-alive agent, and fails the job on any non-2xx answer so
// graphile-worker retries it. Logging is graphile-worker's default (a line per job).
"use strict";

const http = require("node:http");
const { run, makeWorkerUtils } = require("graphile-worker");

// Jobs per addJobs call: one statement each, well inside any statement size limit.
const ADD_CHUNK = 5000;

const connectionString = process.env.DATABASE_URL;

async function prepare() {
  const events = Number(process.env.EVENTS || 50000);
  const utils = await makeWorkerUtils({ connectionString });
  try {
    await utils.migrate();
    for (let start = 0; start < events; start += ADD_CHUNK) {
      const specs = [];
      for (let i = start; i < Math.min(events, start + ADD_CHUNK); i++) {
        // The payload hookgate's burn-down rows carry (burndown.rs).
        specs.push({ identifier: "deliver", payload: { id: `b-${i}`, type: "bench.event" } });
      }
      await utils.addJobs(specs);
    }
  } finally {
    await utils.release();
  }
}

async function work() {
  const concurrency = Number(process.env.CONCURRENCY || 32);
  const localQueue = Number(process.env.LOCAL_QUEUE || 500);
  const target = new URL(process.env.TARGET_URL);
  const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
  const deliver = (payload, helpers) =>
    new Promise((resolve, reject) => {
      const body = JSON.stringify(payload);
      const request = http.request(
        {
          agent,
          host: target.hostname,
          port: target.port,
          path: target.pathname,
          method: "POST",
          headers: {
            "content-type": "application/json",
            "content-length": Buffer.byteLength(body),
            "idempotency-key": `bench:${payload.id}`,
            "hookgate-attempt": String(helpers.job.attempts),
          },
        },
        (response) => {
          response.resume(); // read the body, so the connection is kept
          response.on("end", () => {
            const ok = response.statusCode >= 200 && response.statusCode < 300;
            ok ? resolve() : reject(new Error(`target answered ${response.statusCode}`));
          });
        },
      );
      request.on("error", reject);
      request.end(body);
    });
  const runner = await run({
    taskList: { deliver },
    preset: {
      worker: {
        connectionString,
        concurrentJobs: concurrency,
        localQueue: { size: localQueue },
        completeJobBatchDelay: 0,
      },
    },
  });
  await runner.promise;
}

const command = process.argv[2];
const main = command === "prepare" ? prepare : command === "run" ? work : null;
if (!main) {
  console.error("usage: node worker.js prepare|run");
  process.exit(2);
}
main().catch((error) => {
  console.error(error);
  process.exit(1);
});
