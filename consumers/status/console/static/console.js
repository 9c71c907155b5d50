// jobwheel console: the buttons. Each sends the API call the CLI sends, waits for the
// scheduler's answer as the CLI does (GET /jobs/{id}/commands/{command_id}; a trigger's answer
// is its run), says it, and reloads the page. Same-origin fetches carry the session cookie;
// the X-Jobwheel-Console header is what lets a cookie change anything (see session.py).
"use strict";

(function () {
  const root = document.body.dataset.root || "";
  const flash = document.getElementById("flash");

  function say(text, bad) {
    flash.textContent = text;
    flash.className = bad ? "bad" : "";
    flash.hidden = false;
  }

  async function call(method, path, body) {
    const response = await fetch(root + path, {
      method: method,
      credentials: "same-origin",
      headers: { "content-type": "application/json", "x-jobwheel-console": "1" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let payload = null;
    try { payload = await response.json(); } catch (e) { payload = null; }
    return { status: response.status, payload: payload };
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const enc = encodeURIComponent;

  async function verdict(job, accepted) {
    // the scheduler's answer, as the status store has it (normally within a second)
    for (let i = 0; i < 60; i++) {
      const answer = await call("GET", `/jobs/${enc(job)}/commands/${enc(accepted.command_id)}`);
      if (answer.status === 200) return answer.payload;
      if (accepted.run_id) {
        const run = await call("GET", `/runs/${enc(accepted.run_id)}`);
        if (run.status === 200) return { state: run.payload.run.state, run_id: accepted.run_id };
      }
      await sleep(250);
    }
    return null;
  }

  async function command(button) {
    const job = button.dataset.job;
    const kind = button.dataset.command;
    if (kind === "cancel" && !window.confirm(`Cancel job ${job}? It will not fire again.`)) return;
    document.querySelectorAll("button.action").forEach((b) => { b.disabled = true; });
    say(`${kind}: sending…`);
    const sent = await call("POST", `/jobs/${enc(job)}/${kind}`, {});
    if (sent.status !== 202) {
      say(`${kind} not sent: ${(sent.payload && sent.payload.detail) || "HTTP " + sent.status}`, true);
      document.querySelectorAll("button.action").forEach((b) => { b.disabled = false; });
      return;
    }
    say(`${kind}: sent, waiting for the scheduler's answer…`);
    const answer = await verdict(job, sent.payload);
    if (answer === null) {
      say(`${kind}: sent; no answer from the scheduler yet (is it running?)`, true);
    } else if (answer.state === "REJECTED") {
      say(`${kind} refused by the scheduler: ${answer.reason}`, true);
    } else {
      say(`${kind}: done (${answer.state})`);
    }
    await sleep(600);
    window.location.reload();
  }

  async function replay(button) {
    button.disabled = true;
    say(`replaying dead letter ${button.dataset.ref}…`);
    const sent = await call("POST", "/dead-letters/replay", { refs: [button.dataset.ref] });
    if (sent.status !== 200) {
      say(`replay failed: ${(sent.payload && sent.payload.detail) || "HTTP " + sent.status}`, true);
      button.disabled = false;
      return;
    }
    const [outcome] = sent.payload.replays;
    if (!outcome) say("nothing to replay (already gone?)", true);
    else if (outcome.replayed) say(`replayed ${outcome.ref} (${outcome.what})`);
    else say(`not replayed: ${outcome.skipped}`, true);
  }

  document.addEventListener("click", (event) => {
    const target = event.target.closest("button");
    if (!target) return;
    if (target.classList.contains("action")) command(target);
    else if (target.classList.contains("replay")) replay(target);
  });
})();
