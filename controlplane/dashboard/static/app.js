// gpufleet dashboard: the playground's streaming client (everything else is htmx).
"use strict";

function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.content : "";
}

async function streamCompletion(form) {
  const [cluster, model] = form.target.value.split("|");
  const out = document.getElementById("pg-output");
  const ttftEl = document.getElementById("pg-ttft");
  const tpsEl = document.getElementById("pg-tps");
  const countEl = document.getElementById("pg-tokens");
  out.textContent = "";
  delete out.dataset.done;  // set again when this stream ends
  ttftEl.textContent = "…";
  tpsEl.textContent = "—";
  countEl.textContent = "0";
  const started = performance.now();
  let first = null;
  let tokens = 0;
  const answer = await fetch("/playground/stream", {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrfToken() },
    body: JSON.stringify({
      cluster, model, prompt: form.prompt.value, max_tokens: Number(form.max_tokens.value),
    }),
  });
  if (!answer.ok || !answer.body) {
    out.textContent = "The answer was " + answer.status + ": " + (await answer.text());
    ttftEl.textContent = "—";
    out.dataset.done = "true";
    return;
  }
  const reader = answer.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const frames = buffer.split("\n\n");
    buffer = frames.pop();
    for (const frame of frames) {
      for (const line of frame.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") continue;
        let chunk;
        try { chunk = JSON.parse(data); } catch (e) { continue; }
        if (chunk.error) { out.textContent += "\n[error] " + (chunk.error.message || ""); continue; }
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          const now = performance.now();
          if (first === null) {
            first = now;
            ttftEl.textContent = Math.round(first - started) + " ms";
          }
          tokens += 1;
          out.textContent += delta.content;
          countEl.textContent = String(tokens);
          const seconds = (now - first) / 1000;
          if (seconds > 0) tpsEl.textContent = (tokens / seconds).toFixed(1);
        }
      }
    }
  }
  out.dataset.done = "true";
}

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("playground");
  if (form) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      streamCompletion(form).catch((e) => {
        document.getElementById("pg-output").textContent = "The stream failed: " + e;
      });
    });
  }
});
