// Prometheus' text format, as /metrics writes it: one sample per line.

const SAMPLE = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL = /(\w+)="((?:[^"\\]|\\.)*)"/g;

export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = SAMPLE.exec(line);
    if (!match) continue;
    const labels = {};
    for (const [, name, value] of (match[2] || "").matchAll(LABEL)) {
      labels[name] = value.replace(/\\"/g, '"').replace(/\\n/g, "\n").replace(/\\\\/g, "\\");
    }
    samples.push({ name: match[1], labels, value: Number(match[3]) });
  }
  return samples;
}

// The samples named ``name``, as {label value of ``by``: value}, summed over other labels.
export function byLabel(samples, name, by) {
  const out = {};
  for (const s of samples) {
    if (s.name === name) out[s.labels[by] ?? ""] = (out[s.labels[by] ?? ""] || 0) + s.value;
  }
  return out;
}

