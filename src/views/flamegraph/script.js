"use strict";
// mprof's flamegraph script. Each box is a <g> in #frames: its <title> holds the label and
// then its figures in parentheses, its <rect> where it is in units of width (data-x, data-w),
// its <text> the label that fits. Pointing at a box shows its figures under the picture; a
// click zooms into it (its callers stay, faded, at full width); "Reset Zoom" or Escape go
// back; "Search" (or Ctrl-F) marks the boxes whose label matches and says what share of the
// whole they hold.
var frames, details, unzoomButton, searchButton, matched;
var total, inverted, framesWidth, searchFill = "rgb(230,0,230)", searching = false;

function init() {
    frames = document.getElementById("frames");
    details = document.getElementById("details").firstChild;
    unzoomButton = document.getElementById("unzoom");
    searchButton = document.getElementById("search");
    matched = document.getElementById("matched").firstChild;
    total = Number(frames.getAttribute("data-total"));
    inverted = frames.getAttribute("data-inverted") === "1";
    framesWidth = Number(frames.getAttribute("width"));
    frames.addEventListener("mouseover", function (e) {
        var g = boxOf(e.target);
        if (g) details.nodeValue = g.querySelector("title").textContent;
    });
    frames.addEventListener("mouseout", function () { details.nodeValue = " "; });
    frames.addEventListener("click", function (e) {
        var g = boxOf(e.target);
        if (g) zoom(g);
    });
    unzoomButton.addEventListener("click", unzoom);
    searchButton.addEventListener("click", function () {
        if (searching) clearSearch(); else search();
    });
    window.addEventListener("keydown", function (e) {
        if ((e.ctrlKey || e.metaKey) && e.key === "f") {
            e.preventDefault();
            search();
        } else if (e.key === "Escape") {
            clearSearch();
            unzoom();
        }
    });
}

// The box (a child <g> of #frames) that `node` belongs to, if any.
function boxOf(node) {
    while (node && node !== frames) {
        if (node.nodeName === "g" && node.parentNode === frames) return node;
        node = node.parentNode;
    }
    return null;
}

function boxes() { return frames.querySelectorAll(":scope > g"); }

function num(element, name) { return Number(element.getAttribute(name)); }

// The label of a box: its title without the last parenthesised group (the figures).
function labelOf(g) {
    var title = g.querySelector("title").textContent;
    var at = title.lastIndexOf(" (");
    return at < 0 ? title : title.slice(0, at);
}

// What mprof's fitted_label does (src/views/flamegraph/boxes.rs): the label, else the file
// without its directories, else the function alone, else the function cut from the right.
function fit(label, pixels) {
    var n = Math.max(0, Math.floor((pixels - 3) / (12 * 0.59)));
    var chars = Array.from(label);
    if (chars.length <= n) return label;
    var at = label.lastIndexOf(" (");
    if (at >= 0) {
        var fn = label.slice(0, at), place = label.slice(at + 2);
        var shorter = fn + " (" + place.slice(place.lastIndexOf("/") + 1);
        if (Array.from(shorter).length <= n) return shorter;
        if (Array.from(fn).length <= n) return fn;
    }
    return n < 3 ? "" : chars.slice(0, n - 2).join("") + "..";
}

// Puts a box at `x` percent, `w` percent wide, and fits its label.
function place(g, x, w) {
    var rect = g.querySelector("rect"), text = g.querySelector("text");
    rect.setAttribute("x", x.toFixed(4) + "%");
    rect.setAttribute("width", w.toFixed(4) + "%");
    text.setAttribute("x", (x + 0.25).toFixed(4) + "%");
    text.textContent = fit(labelOf(g), w / 100 * framesWidth);
}

// Shows `g` across the whole width, what it called within it, and its callers faded.
function zoom(g) {
    var z = g.querySelector("rect");
    var zx = num(z, "data-x"), zw = num(z, "data-w"), zy = num(z, "y");
    boxes().forEach(function (b) {
        var r = b.querySelector("rect");
        var x = num(r, "data-x"), w = num(r, "data-w"), y = num(r, "y");
        var caller = inverted ? y < zy : y > zy;
        b.classList.remove("hide", "parent");
        if (caller && x <= zx && x + w >= zx + zw) {
            b.classList.add("parent");
            place(b, 0, 100);
        } else if (!caller && x >= zx && x + w <= zx + zw) {
            place(b, (x - zx) / zw * 100, w / zw * 100);
        } else {
            b.classList.add("hide");
        }
    });
    unzoomButton.classList.remove("hide");
}

function unzoom() {
    boxes().forEach(function (b) {
        var r = b.querySelector("rect");
        b.classList.remove("hide", "parent");
        place(b, num(r, "data-x") / total * 100, num(r, "data-w") / total * 100);
    });
    unzoomButton.classList.add("hide");
}

// Asks for a regular expression (or plain text) and marks the boxes whose label matches.
function search() {
    var term = prompt("Search the labels (a regular expression)", "");
    if (!term) return;
    clearSearch();
    var re;
    try {
        re = new RegExp(term);
    } catch (e) {
        re = new RegExp(term.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    }
    var spans = [];
    boxes().forEach(function (b) {
        if (!re.test(labelOf(b))) return;
        var r = b.querySelector("rect");
        r.setAttribute("data-fill", r.getAttribute("fill"));
        r.setAttribute("fill", searchFill);
        spans.push([num(r, "data-x"), num(r, "data-x") + num(r, "data-w")]);
    });
    // A match inside another one is counted once.
    spans.sort(function (a, b) { return a[0] - b[0]; });
    var covered = 0, end = -1;
    spans.forEach(function (s) {
        if (s[0] >= end) {
            covered += s[1] - s[0];
            end = s[1];
        } else if (s[1] > end) {
            covered += s[1] - end;
            end = s[1];
        }
    });
    searching = true;
    searchButton.classList.add("show");
    searchButton.firstChild.nodeValue = "Reset Search";
    matched.nodeValue = "Matched: " + (100 * covered / total).toFixed(1) + "%";
}

function clearSearch() {
    if (!searching) return;
    frames.querySelectorAll("rect[data-fill]").forEach(function (r) {
        r.setAttribute("fill", r.getAttribute("data-fill"));
        r.removeAttribute("data-fill");
    });
    searching = false;
    searchButton.classList.remove("show");
    searchButton.firstChild.nodeValue = "Search";
    matched.nodeValue = " ";
}
