// Line charts of step metrics on a canvas (no library): one chart per metric, redrawn as steps arrive.
"use strict";

window.KeraunosCharts = (() => {
  const WIDTH = 420;
  const HEIGHT = 200;
  const PAD = 36;

  /** A chart of `key` over the records' steps: `{node, draw(records)}`. */
  function lineChart(label, key) {
    const canvas = document.createElement("canvas");
    canvas.width = WIDTH;
    canvas.height = HEIGHT;
    const title = document.createElement("h3");
    title.textContent = label;
    const last = document.createElement("span");
    last.className = "last";
    title.append(" ", last);
    const node = document.createElement("figure");
    node.className = "chart";
    node.dataset.metric = key;
    node.append(title, canvas);

    function draw(records) {
      const points = records
        .map((r) => [r.step, r[key]])
        .filter(([, v]) => v !== null && v !== undefined && Number.isFinite(v));
      node.dataset.points = String(points.length);
      const ctx = canvas.getContext("2d");
      ctx.clearRect(0, 0, WIDTH, HEIGHT);
      ctx.strokeStyle = "#999";
      ctx.strokeRect(PAD, 8, WIDTH - PAD - 8, HEIGHT - PAD - 8);
      if (!points.length) {
        last.textContent = "(no data)";
        return;
      }
      const xs = points.map((p) => p[0]);
      const ys = points.map((p) => p[1]);
      const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
      let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
      if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
      const sx = (x) => PAD + ((x - x0) / Math.max(1, x1 - x0)) * (WIDTH - PAD - 8);
      const sy = (y) => HEIGHT - PAD - ((y - y0) / (y1 - y0)) * (HEIGHT - PAD - 8);
      ctx.fillStyle = "#555";
      ctx.font = "11px sans-serif";
      ctx.fillText(y1.toPrecision(3), 2, 16);
      ctx.fillText(y0.toPrecision(3), 2, HEIGHT - PAD);
      ctx.fillText(`step ${x0}`, PAD, HEIGHT - PAD + 14);
      ctx.fillText(`step ${x1}`, WIDTH - 60, HEIGHT - PAD + 14);
      ctx.strokeStyle = "#2563eb";
      ctx.lineWidth = 2;
      ctx.beginPath();
      points.forEach(([x, y], i) => (i ? ctx.lineTo(sx(x), sy(y)) : ctx.moveTo(sx(x), sy(y))));
      ctx.stroke();
      ctx.fillStyle = "#2563eb";
      for (const [x, y] of points) ctx.fillRect(sx(x) - 2, sy(y) - 2, 4, 4);
      last.textContent = `last ${ys[ys.length - 1].toPrecision(4)}`;
    }

    return { node, draw };
  }

  return { lineChart };
})();
