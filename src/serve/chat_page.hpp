// The chat page `hanpu serve` answers at / (docs/SERVE.md): one self-contained HTML file, no
// external scripts, styles or fonts (the server may run with no network). It talks to
// /v1/chat/completions with stream: true like any other client: replies stream in, reasoning
// (reasoning_content) is shown folded, tool calls are shown, and the footer of each reply gives
// tokens/s and the prompt tokens the prefix cache reused.
#pragma once

namespace hanpu::serve {

inline const char* chat_page_html() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>hanpu chat</title>
<style>
body{font-family:system-ui,sans-serif;margin:0;display:flex;flex-direction:column;height:100vh;background:#fafafa}
header{padding:.5em 1em;background:#223;color:#eee;display:flex;gap:1em;align-items:center}
header input{width:12em}
#log{flex:1;overflow-y:auto;padding:1em}
.msg{max-width:50em;margin:.5em 0;padding:.6em .8em;border-radius:.5em;white-space:pre-wrap;word-wrap:break-word}
.user{background:#dde8ff;margin-left:auto}
.assistant{background:#fff;border:1px solid #ddd}
.reasoning{color:#666;font-size:.9em}
.tool{font-family:monospace;background:#f3f3e0;padding:.3em;margin-top:.3em}
.stats{color:#888;font-size:.8em;margin-top:.3em}
.error{color:#b00}
form{display:flex;gap:.5em;padding:.8em;border-top:1px solid #ddd}
textarea{flex:1;height:3.5em;font:inherit}
</style></head>
<body>
<header><b>hanpu</b><span id="model">…</span>
<label>system <input id="system" placeholder="system prompt"></label>
<label>max tokens <input id="max_tokens" type="number" value="512" style="width:5em"></label>
<label>temperature <input id="temperature" type="number" value="0.8" step="0.1" min="0" max="2" style="width:4em"></label>
<label>API key <input id="key" type="password" placeholder="if --api-key"></label>
<button id="clear" type="button">new chat</button></header>
<div id="log"></div>
<form id="form"><textarea id="input" placeholder="Message (Enter sends, Shift+Enter: new line)"></textarea>
<button id="send" type="submit">Send</button></form>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let history = [], model = null, busy = false;
$("key").value = localStorage.getItem("hanpu_key") || "";
$("key").onchange = () => localStorage.setItem("hanpu_key", $("key").value);
function headers() {
  const h = {"Content-Type": "application/json"};
  if ($("key").value) h["Authorization"] = "Bearer " + $("key").value;
  return h;
}
async function loadModel() {
  try {
    const r = await fetch("/v1/models", {headers: headers()});
    const j = await r.json();
    model = j.data[0].id;
    $("model").textContent = model;
  } catch (e) { $("model").textContent = "(no model: " + e + ")"; }
}
function bubble(role) {
  const d = document.createElement("div");
  d.className = "msg " + role;
  $("log").appendChild(d);
  return d;
}
$("clear").onclick = () => { history = []; $("log").innerHTML = ""; };
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
$("form").onsubmit = async (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || busy) return;
  if (!model) await loadModel();
  busy = true; $("send").disabled = true; $("input").value = "";
  bubble("user").textContent = text;
  history.push({role: "user", content: text});
  const box = bubble("assistant");
  const details = document.createElement("details"); details.className = "reasoning";
  const summary = document.createElement("summary"); summary.textContent = "reasoning";
  const reasoningText = document.createElement("div");
  details.append(summary, reasoningText);
  const content = document.createElement("div"); content.className = "content";
  const tools = document.createElement("div");
  const stats = document.createElement("div"); stats.className = "stats";
  box.append(content, tools, stats);
  let reasoning = "", answer = "", calls = [], usage = null, firstAt = null, pieces = 0;
  const started = performance.now();
  const messages = ($("system").value ? [{role: "system", content: $("system").value}] : []).concat(history);
  try {
    const r = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), body: JSON.stringify({
      model, messages, stream: true, stream_options: {include_usage: true},
      max_tokens: parseInt($("max_tokens").value) || 512,
      temperature: parseFloat($("temperature").value) >= 0 ? parseFloat($("temperature").value) : 0.8})});
    if (!r.ok) throw new Error((await r.json()).error.message);
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const line = buf.slice(0, cut); buf = buf.slice(cut + 2);
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        if (j.usage) usage = j.usage;
        for (const c of j.choices || []) {
          const d = c.delta || {};
          if (d.reasoning_content) {
            if (!reasoning) box.insertBefore(details, content);
            reasoning += d.reasoning_content; reasoningText.textContent = reasoning;
          }
          if (d.content) { answer += d.content; content.textContent = answer; }
          // A call's first delta has its id, type and name; its arguments follow in pieces.
          if (d.tool_calls) for (const t of d.tool_calls) {
            let c = calls[t.index];
            if (!c) {
              c = calls[t.index] = {index: t.index, id: t.id, type: t.type, function: {name: t.function.name, arguments: ""}};
              c.el = document.createElement("div"); c.el.className = "tool";
              tools.appendChild(c.el);
            }
            c.function.arguments += t.function.arguments || "";
            c.el.textContent = "tool call: " + c.function.name + "(" + c.function.arguments + ")";
          }
          if (d.content || d.reasoning_content) { pieces++; if (firstAt === null) firstAt = performance.now(); }
        }
        $("log").scrollTop = $("log").scrollHeight;
      }
    }
    const msg = {role: "assistant", content: answer};
    if (calls.length) msg.tool_calls = calls.filter(Boolean).map(({index, el, ...t}) => t);
    history.push(msg);
    if (usage) {
      const secs = (performance.now() - (firstAt ?? started)) / 1000;
      const tps = usage.completion_tokens > 1 && secs > 0 ? ((usage.completion_tokens - 1) / secs).toFixed(1) : "–";
      const cached = (usage.prompt_tokens_details || {}).cached_tokens || 0;
      stats.textContent = usage.completion_tokens + " tokens, " + tps + " tokens/s; prompt " + usage.prompt_tokens +
        " tokens, " + cached + " from the cache; first token after " +
        (((firstAt ?? performance.now()) - started) / 1000).toFixed(2) + " s";
    }
  } catch (err) {
    const p = document.createElement("div"); p.className = "error"; p.textContent = String(err.message || err);
    box.appendChild(p);
    history.pop();
  } finally { busy = false; $("send").disabled = false; }
};
loadModel();
</script></body></html>
)HTML";
}

}  // namespace hanpu::serve
