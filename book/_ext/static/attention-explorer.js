/* Explorable attention maps, offline.
 *
 * coursebook/attention_explorer.py writes each map as a <div class="attention-explorer">
 * holding its data (JSON in <script type="application/json">) and a static heat map image.
 * This script, bundled into the site (no network), turns every such div into controls:
 * choose the layer, the head and the query position (also by hovering or clicking a row
 * of the map) and read that query's weights over the keys, one labelled bar per key.
 * Without JavaScript the reader keeps the static image.
 *
 * The numbers shown are in the DOM for the browser tests: each bar carries data-key (the
 * key position) and data-weight (the weight as embedded in the page).
 */
(function () {
  "use strict";

  var SVG = "http://www.w3.org/2000/svg";
  var CELL = 20;
  var FONT = 11;
  var counter = 0;

  // Viridis, as matplotlib draws the static image: nine stops, interpolated linearly.
  var VIRIDIS = [
    [68, 1, 84], [71, 45, 123], [59, 82, 139], [44, 114, 142], [33, 145, 140],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]
  ];

  function colour(t) {
    t = Math.max(0, Math.min(1, t)) * (VIRIDIS.length - 1);
    var i = Math.min(Math.floor(t), VIRIDIS.length - 2);
    var f = t - i;
    var a = VIRIDIS[i], b = VIRIDIS[i + 1];
    return "rgb(" + [0, 1, 2].map(function (c) {
      return Math.round(a[c] + f * (b[c] - a[c]));
    }).join(",") + ")";
  }

  function element(tag, attrs, text) {
    var node = document.createElement(tag);
    setAttrs(node, attrs);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function svgElement(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function setAttrs(node, attrs) {
    Object.keys(attrs || {}).forEach(function (name) {
      node.setAttribute(name, attrs[name]);
    });
  }

  function selectControl(id, label, options, cls) {
    var wrap = element("div", {"class": "ae-control"});
    wrap.appendChild(element("label", {"for": id}, label));
    var select = element("select", {id: id, "class": cls});
    options.forEach(function (text, i) {
      select.appendChild(element("option", {value: String(i)}, text));
    });
    if (options.length < 2) select.disabled = true;
    wrap.appendChild(select);
    return {wrap: wrap, select: select};
  }

  // Width in viewBox units that the longest label needs, roughly.
  function labelSpace(tokens) {
    var longest = tokens.reduce(function (m, t) { return Math.max(m, t.length); }, 1);
    return Math.min(12, longest) * FONT * 0.62 + 8;
  }

  function shortLabel(token) {
    return token.length > 12 ? token.slice(0, 11) + "\u2026" : token;
  }

  function buildMap(data, onPreview, onChoose, onLeave) {
    var nq = data.queries.length, nk = data.keys.length;
    var left = labelSpace(data.queries), top = labelSpace(data.keys);
    var width = left + nk * CELL + 4, height = top + nq * CELL + 4;
    var svg = svgElement("svg", {
      "class": "ae-grid", viewBox: "0 0 " + width + " " + height,
      role: "img", "aria-label": "Attention map: queries down, keys across",
      style: "max-width:" + Math.round(width * 1.25) + "px"
    });
    data.keys.forEach(function (token, j) {
      var x = left + j * CELL + CELL / 2 + FONT * 0.35, y = top - 4;
      var label = svgElement("text", {
        "class": "ae-key-label", x: x, y: y, "font-size": FONT,
        transform: "rotate(-90 " + x + " " + y + ")"
      }, shortLabel(token));
      label.appendChild(svgElement("title", {}, token));
      svg.appendChild(label);
    });
    var cells = [], rows = [];
    data.queries.forEach(function (token, i) {
      var row = svgElement("g", {"class": "ae-row", "data-query": String(i)});
      var label = svgElement("text", {
        "class": "ae-query-label", x: left - 4, y: top + i * CELL + CELL / 2 + FONT * 0.35,
        "font-size": FONT, "text-anchor": "end"
      }, shortLabel(token));
      label.appendChild(svgElement("title", {}, token));
      row.appendChild(label);
      // A transparent strip behind the labels, so the whole row answers the pointer.
      row.appendChild(svgElement("rect", {
        "class": "ae-row-hit", x: 0, y: top + i * CELL, width: left, height: CELL
      }));
      var line = [];
      data.keys.forEach(function (_, j) {
        var cell = svgElement("rect", {
          "class": "ae-cell", x: left + j * CELL, y: top + i * CELL, width: CELL, height: CELL
        });
        cell.appendChild(svgElement("title"));
        row.appendChild(cell);
        line.push(cell);
      });
      row.addEventListener("mouseenter", function () { onPreview(i); });
      row.addEventListener("click", function () { onChoose(i); });
      svg.appendChild(row);
      cells.push(line);
      rows.push(row);
    });
    var outline = svgElement("rect", {
      "class": "ae-outline", x: left, y: top, width: nk * CELL, height: CELL
    });
    svg.appendChild(outline);
    svg.addEventListener("mouseleave", onLeave);
    return {
      svg: svg,
      paint: function (map, query) {
        var max = 0;
        map.forEach(function (row) { row.forEach(function (w) { max = Math.max(max, w); }); });
        map.forEach(function (row, i) {
          row.forEach(function (w, j) {
            var cell = cells[i][j];
            cell.setAttribute("fill", colour(max > 0 ? w / max : 0));
            cell.setAttribute("data-weight", String(w));
            cell.firstChild.textContent = data.queries[i] + " \u2192 " + data.keys[j] + ": " + w.toFixed(4);
          });
        });
        rows.forEach(function (row, i) { row.classList.toggle("ae-current", i === query); });
        outline.setAttribute("y", top + query * CELL);
      }
    };
  }

  function buildBars(data) {
    var list = element("ol", {"class": "ae-bars"});
    var bars = data.keys.map(function (token, j) {
      var item = element("li", {"class": "ae-bar", "data-key": String(j)});
      var key = element("span", {"class": "ae-key", title: token}, token);
      var track = element("span", {"class": "ae-track", "aria-hidden": "true"});
      var fill = element("span", {"class": "ae-fill"});
      track.appendChild(fill);
      var value = element("span", {"class": "ae-value"});
      item.appendChild(key);
      item.appendChild(track);
      item.appendChild(value);
      list.appendChild(item);
      return {item: item, fill: fill, value: value};
    });
    return {
      list: list,
      show: function (weights) {
        weights.forEach(function (w, j) {
          bars[j].item.setAttribute("data-weight", String(w));
          bars[j].fill.style.width = (100 * Math.max(0, Math.min(1, w))) + "%";
          bars[j].value.textContent = w.toFixed(4);
        });
      }
    };
  }

  function explore(root) {
    var source = root.querySelector("script.attention-explorer-data");
    if (!source || root.getAttribute("data-ae-ready")) return;
    var data = JSON.parse(source.textContent);
    var id = "ae" + (++counter);
    var state = {layer: 0, head: 0, query: 0, shown: 0};

    // MathJax leaves the widget alone: a token such as "$x$" stays as written.
    var widget = element("div", {"class": "ae-widget tex2jax_ignore mathjax_ignore"});
    var controls = element("div", {"class": "ae-controls"});
    var layer = selectControl(id + "-layer", "Layer", data.layers, "ae-layer");
    var head = selectControl(id + "-head", "Head", data.heads, "ae-head");
    var query = selectControl(id + "-query", "Query", data.queries.map(function (t, i) {
      return i + ": " + t;
    }), "ae-query");
    [layer, head, query].forEach(function (c) { controls.appendChild(c.wrap); });

    var panels = element("div", {"class": "ae-panels"});
    var mapBox = element("div", {"class": "ae-map"});
    var barBox = element("div", {"class": "ae-weights"});
    var caption = element("p", {"class": "ae-caption", "aria-live": "polite"});
    var bars = buildBars(data);
    var map = buildMap(data, function (i) { show(i); }, function (i) {
      state.query = i;
      query.select.value = String(i);
      show(i);
    }, function () { show(state.query); });
    mapBox.appendChild(map.svg);
    mapBox.appendChild(element("p", {"class": "ae-hint"},
      "Rows are queries, columns keys. Hover a row to preview it, click to choose it."));
    barBox.appendChild(caption);
    barBox.appendChild(bars.list);
    panels.appendChild(barBox);
    panels.appendChild(mapBox);
    widget.appendChild(controls);
    widget.appendChild(panels);

    function show(q) {
      var weights = data.weights[state.layer][state.head];
      state.shown = q;
      map.paint(weights, q);
      bars.show(weights[q]);
      caption.textContent = "Weights of query " + q + " \u201c" + data.queries[q] + "\u201d over the keys (" +
        data.layers[state.layer] + ", " + data.heads[state.head] + ")";
      widget.setAttribute("data-layer", String(state.layer));
      widget.setAttribute("data-head", String(state.head));
      widget.setAttribute("data-query", String(q));
    }

    layer.select.addEventListener("change", function () {
      state.layer = Number(layer.select.value);
      show(state.query);
    });
    head.select.addEventListener("change", function () {
      state.head = Number(head.select.value);
      show(state.query);
    });
    query.select.addEventListener("change", function () {
      state.query = Number(query.select.value);
      show(state.query);
    });

    root.appendChild(widget);
    root.classList.add("ae-interactive");
    root.setAttribute("data-ae-ready", "1");
    show(0);
  }

  function start() {
    var roots = document.querySelectorAll("div.attention-explorer");
    for (var i = 0; i < roots.length; i++) {
      try {
        explore(roots[i]);
      } catch (err) {
        // A broken map keeps its static image; the rest of the page still works.
        roots[i].classList.remove("ae-interactive");
        if (window.console) console.warn("attention explorer:", err);
      }
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
