package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

var plotColors = map[string]string{
	"direct":  "#7f7f7f",
	"keyway":  "#d62728",
	"haproxy": "#1f77b4",
	"nginx":   "#2ca02c",
	"caddy":   "#9467bd",
}

// plot draws an HDR-style latency percentile plot for one rate: x is the
// percentile on a log scale of 1/(1-p) from p50 to p99.99, y the latency
// in ms on a log scale (p50s of a tenth of a millisecond and tails of tens
// of milliseconds both stay readable), one line per target: at each
// percentile the median over rounds.
func (r *Report) plot(rate int) string {
	const (
		w, h                     = 820, 480
		left, right, top, bottom = 70, 150, 50, 60
	)
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	xlo, xhi := math.Log10(2), 4.0
	type line struct {
		name string
		pts  []CurvePoint
	}
	var lines []line
	ymin, ymax := math.Inf(1), 0.0
	for _, s := range r.Summary {
		for _, l := range s.Latency {
			if l.Rate == rate && len(l.Curve) > 0 {
				lines = append(lines, line{s.Target, l.Curve})
				for _, p := range l.Curve {
					ymax = max(ymax, p.Ms)
					if p.Ms > 0 {
						ymin = min(ymin, p.Ms)
					}
				}
			}
		}
	}
	if math.IsInf(ymin, 1) {
		ymin = 0.1
	}
	ylo, yhi := math.Log10(niceFloor(ymin)), math.Log10(niceCeil(ymax))
	if yhi <= ylo {
		yhi = ylo + 1
	}
	xpos := func(p float64) float64 {
		x := -math.Log10(1 - p/100)
		return float64(left) + (x-xlo)/(xhi-xlo)*pw
	}
	ypos := func(ms float64) float64 {
		v := math.Log10(max(ms, math.Pow(10, ylo)))
		return float64(top) + ph - (v-ylo)/(yhi-ylo)*ph
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15" font-weight="bold">Latency by percentile at %d req/s, open loop (median of %d round(s))</text>`+"\n", left, rate, r.Config.Rounds)
	// Grid and axes.
	for _, p := range []float64{50, 90, 99, 99.9, 99.99} {
		x := xpos(p)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, top, x, h-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%g%%</text>`+"\n", x, h-bottom+18, p)
	}
	for e := math.Floor(ylo); e <= yhi; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if lv := math.Log10(v); lv < ylo-1e-9 || lv > yhi+1e-9 {
				continue
			}
			y := ypos(v)
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, w-right, y)
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, trimFloat(v))
		}
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">percentile</text>`+"\n", float64(left)+pw/2, h-16)
	fmt.Fprintf(&b, `<text x="18" y="%.1f" text-anchor="middle" transform="rotate(-90 18 %.1f)">latency, ms</text>`+"\n", float64(top)+ph/2, float64(top)+ph/2)
	// Lines and legend.
	for i, l := range lines {
		color := plotColors[l.name]
		if color == "" {
			color = "#000"
		}
		var pts []string
		for _, p := range l.pts {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xpos(p.Percentile), ypos(p.Ms)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		y := top + 10 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", w-right+12, y, w-right+36, y, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", w-right+42, y+4, html.EscapeString(l.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceFloor rounds v down to 1, 2 or 5 times a power of ten.
func niceFloor(v float64) float64 {
	if v <= 0 {
		return 0.01
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{5, 2, 1} {
		if v >= m*e {
			return m * e
		}
	}
	return e
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}
