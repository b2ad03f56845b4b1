// A sandbox's timeout action as the sandbox page shows it (what its TTL's expiry does, whether requests wake it).
import { fmtTime } from "./dom.js";

export function timeoutText(s) {
  const action = s.on_timeout || "kill";
  if (action !== "hibernate") return action;
  const wake = s.auto_wake === false ? "wake it to resume" : "any request wakes it";
  const since = s.hibernated_at ? `, hibernated since ${fmtTime(s.hibernated_at)}` : "";
  return `hibernate (${wake}${since})`;
}
