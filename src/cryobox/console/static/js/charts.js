// Small canvas charts (no library): a line chart of a rate over time and a heatmap of the create-latency
// histogram over time. Sized to the canvas's CSS box and the device pixel ratio.
const COLORS = { line: "#2563eb", grid: "#e5e7eb", text: "#4b5563", fill: "rgba(37,99,235,0.12)" };

function setup(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 400;
  const height = canvas.clientHeight || 160;
  if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
  if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px sans-serif";
  return { ctx, width, height };
}

function niceMax(value) {
  if (value <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 5, 10]) if (value <= m * p) return m * p;
  return 10 * p;
}

function timeAxis(ctx, t0, t1, left, right, bottom) {
  ctx.fillStyle = COLORS.text;
  const span = Math.max(1, t1 - t0);
  for (let i = 0; i <= 4; i += 1) {
    ctx.textAlign = i === 0 ? "left" : i === 4 ? "right" : "center";
    const t = t0 + (span * i) / 4;
    const x = left + ((right - left) * i) / 4;
    ctx.fillText(new Date(t * 1000).toISOString().slice(11, 19), x, bottom + 14);
  }
}

/** points: [[t, value], ...] (value per second). */
export function lineChart(canvas, points) {
  const { ctx, width, height } = setup(canvas);
  const left = 44;
  const right = width - 8;
  const top = 12;
  const bottom = height - 20;
  const max = niceMax(Math.max(0, ...points.map((p) => p[1])));
  ctx.strokeStyle = COLORS.grid;
  ctx.fillStyle = COLORS.text;
  ctx.textAlign = "right";
  for (let i = 0; i <= 4; i += 1) {
    const y = bottom - ((bottom - top) * i) / 4;
    ctx.beginPath();
    ctx.moveTo(left, y);
    ctx.lineTo(right, y);
    ctx.stroke();
    ctx.fillText(`${+((max * i) / 4).toPrecision(3)}`, left - 4, y + 4);
  }
  if (points.length < 2) {
    ctx.textAlign = "center";
    ctx.fillText("waiting for samples…", (left + right) / 2, (top + bottom) / 2);
    return;
  }
  const t0 = points[0][0];
  const t1 = points[points.length - 1][0];
  const x = (t) => left + ((right - left) * (t - t0)) / Math.max(1, t1 - t0);
  const y = (v) => bottom - ((bottom - top) * v) / max;
  ctx.beginPath();
  points.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
  ctx.strokeStyle = COLORS.line;
  ctx.lineWidth = 2;
  ctx.stroke();
  ctx.lineTo(x(t1), bottom);
  ctx.lineTo(x(t0), bottom);
  ctx.closePath();
  ctx.fillStyle = COLORS.fill;
  ctx.fill();
  ctx.lineWidth = 1;
  timeAxis(ctx, t0, t1, left, right, bottom);
}

/**
 * columns: [{t, counts: [n per bucket]}] (creates that finished in that interval, per latency bucket);
 * bounds: bucket upper bounds in seconds (the last may be Infinity).
 */
export function heatmap(canvas, columns, bounds) {
  const { ctx, width, height } = setup(canvas);
  const left = 52;
  const right = width - 8;
  const top = 8;
  const bottom = height - 20;
  ctx.fillStyle = COLORS.text;
  ctx.textAlign = "right";
  const rows = bounds.length;
  if (!rows || columns.length < 1) {
    ctx.textAlign = "center";
    ctx.fillText("no creates yet", (left + right) / 2, (top + bottom) / 2);
    return;
  }
  const rowH = (bottom - top) / rows;
  bounds.forEach((le, i) => {
    if (rows <= 12 || i % Math.ceil(rows / 12) === 0) {
      ctx.fillText(Number.isFinite(le) ? `≤${le}s` : "+Inf", left - 4, bottom - rowH * i - rowH / 2 + 4);
    }
  });
  const max = Math.max(1, ...columns.flatMap((c) => c.counts));
  const colW = (right - left) / columns.length;
  columns.forEach((column, ci) => {
    column.counts.forEach((n, ri) => {
      if (!n) return;
      const a = 0.15 + 0.85 * (n / max);
      ctx.fillStyle = `rgba(220, 38, 38, ${a.toFixed(3)})`;
      ctx.fillRect(left + ci * colW, bottom - rowH * (ri + 1), Math.max(1, colW - 0.5), Math.max(1, rowH - 0.5));
    });
  });
  ctx.strokeStyle = COLORS.grid;
  ctx.strokeRect(left, top, right - left, bottom - top);
  timeAxis(ctx, columns[0].t, columns[columns.length - 1].t, left, right, bottom);
}
