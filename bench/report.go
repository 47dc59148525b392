package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the reports side by side: one row per target, and the
// ratios of the first target to each other one.
func WriteTable(w io.Writer, reports []*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tmode\tbatch\tdecisions/s\tp50 ms\tp90 ms\tp99 ms\tp99.9 ms\tmax ms\tadmitted\tdenied\terrors\tdegraded\tB/recipient\tover-admitted\t")
	for _, r := range reports {
		over := fmt.Sprintf("%d of %d", r.OverAdmissions, r.Audited)
		if r.AuditSkipped != "" {
			over = "not audited"
		}
		bpr := "-"
		if r.BytesPerRecipient > 0 {
			bpr = fmt.Sprintf("%.0f", r.BytesPerRecipient)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%d\t%d\t%d\t%d\t%s\t%s\t\n",
			r.Target, r.Mode, r.Batch, r.PerSecond, r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.P999, r.Latency.Max,
			r.Admitted, r.Denied, r.Errors, r.Degraded, bpr, over)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range reports {
		if r.StartLateness != (Latency{}) {
			fmt.Fprintf(w, "\n%s, %s: calls started behind their time by p50 / p90 / p99 %.3f / %.3f / %.3f ms; from their actual start they took %.3f / %.3f / %.3f ms\n",
				r.Target, r.Mode, r.StartLateness.P50, r.StartLateness.P90, r.StartLateness.P99, r.Service.P50, r.Service.P90, r.Service.P99)
		}
		if err := writeStages(w, r); err != nil {
			return err
		}
	}
	if len(reports) < 2 {
		return nil
	}
	a := reports[0]
	fmt.Fprintln(w)
	for _, b := range reports[1:] {
		fmt.Fprintf(w, "%s vs %s: %s decisions/s, %s p99 latency", a.Target, b.Target,
			ratio(a.PerSecond, b.PerSecond, "×"), ratio(b.Latency.P99, a.Latency.P99, "× lower"))
		if a.BytesPerRecipient > 0 && b.BytesPerRecipient > 0 {
			fmt.Fprintf(w, ", %s memory per recipient", ratio(b.BytesPerRecipient, a.BytesPerRecipient, "× smaller"))
		}
		fmt.Fprintln(w)
	}
	return nil
}

// writeStages prints where r's nodes spent the time of their calls, stage
// by stage, if they reported it.
func writeStages(w io.Writer, r *Report) error {
	if len(r.Stages) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\n%s, %s: the nodes' calls by stage (check: at the node a call reached; forward: at the owner it forwarded to; replicate: at a backup)\n", r.Target, r.Mode)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "call\tstage\tcount\tp50 ms\tp90 ms\tp99 ms\tp99.9 ms\tmax ms\t")
	for _, s := range r.Stages {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t\n", s.Call, s.Stage, s.Count, s.Latency.P50, s.Latency.P90, s.Latency.P99, s.Latency.P999, s.Latency.Max)
	}
	return tw.Flush()
}

func ratio(x, y float64, unit string) string {
	if y == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%s", x/y, unit)
}

// WriteJSON writes the reports to path as indented JSON.
func WriteJSON(path string, reports []*Report) error {
	b, err := json.MarshalIndent(reports, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// The chart's geometry, in SVG pixels: the page's width, and each panel's
// height and the gap below it.
const chartWidth, panelHeight, panelGap = 900, 260, 70

// chartColors are the lines' colours, one per target in report order,
// repeating after the last.
var chartColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"}

// WriteSVG draws the reports on one page: decisions/s over time, p99 call
// latency over time, and the latency distribution of each target.
func WriteSVG(path string, reports []*Report) error {
	var b strings.Builder
	h := 3*(panelHeight+panelGap) + 40
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", chartWidth, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	thr, p99, dist, maxT := chartSeries(reports)
	var tt []float64
	for t := 0.0; t <= maxT; t += math.Max(1, math.Ceil(maxT/10)) {
		tt = append(tt, t)
	}
	secLabel := func(x float64) string { return fmt.Sprintf("%.0f", x) }
	panels := []chartPanel{
		{top: 20, title: "Throughput", xlabel: "seconds", ylabel: "decisions/s", ss: thr, xticks: tt, xtickLabel: secLabel},
		{top: 20 + panelHeight + panelGap, title: "p99 call latency per second", xlabel: "seconds", ylabel: "ms (log)", ss: p99, logY: true, xticks: tt, xtickLabel: secLabel},
		{top: 20 + 2*(panelHeight+panelGap), title: "Latency distribution", xlabel: "percentile", ylabel: "ms (log)", ss: dist, logY: true,
			xticks: []float64{0, nines(50), nines(90), nines(99), nines(99.9), nines(99.99)},
			xtickLabel: func(x float64) string {
				return fmt.Sprintf("%g%%", math.Round((1-math.Pow(10, -x))*1e6)/1e4)
			}},
	}
	for i := range panels {
		panels[i].write(&b)
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// chartSeries returns the lines of WriteSVG's three panels, one per report:
// decisions and p99 latency (ms) per second, the latency (ms) at each
// percentile below 100 (in nines), and the last second of any report.
func chartSeries(reports []*Report) (thr, p99, dist []series, maxT float64) {
	for _, r := range reports {
		var s1, s2 series
		s1.name, s2.name = r.Target, r.Target
		for _, sec := range r.Series {
			s1.xs, s1.ys = append(s1.xs, float64(sec.T)), append(s1.ys, float64(sec.Decisions))
			s2.xs, s2.ys = append(s2.xs, float64(sec.T)), append(s2.ys, sec.P99)
			maxT = math.Max(maxT, float64(sec.T))
		}
		thr, p99 = append(thr, s1), append(p99, s2)
		var s3 series
		s3.name = r.Target
		for _, p := range r.Percentiles {
			if p[0] >= 100 {
				continue
			}
			s3.xs, s3.ys = append(s3.xs, nines(p[0])), append(s3.ys, p[1])
		}
		dist = append(dist, s3)
	}
	return thr, p99, dist, maxT
}

// chartPanel is one panel of WriteSVG's page: a titled plot of lines, top
// pixels from the top of the page.
type chartPanel struct {
	top                   int
	title, xlabel, ylabel string
	ss                    []series
	logY                  bool // a logarithmic y axis
	xticks                []float64
	xtickLabel            func(float64) string
}

// panelScale maps a panel's data to pixels: x linearly onto [left, right],
// y linearly or, with logY, logarithmically onto [y0, y1] (y0 the bottom).
type panelScale struct {
	left, right, y0, y1    float64
	xmin, xmax, ymin, ymax float64
	logY                   bool
}

// x returns the pixel column of the data value x.
func (s *panelScale) x(x float64) float64 {
	return s.left + (x-s.xmin)/(s.xmax-s.xmin)*(s.right-s.left)
}

// y returns the pixel row of the data value y; with logY, a value below
// ymin is drawn at ymin.
func (s *panelScale) y(y float64) float64 {
	if s.logY {
		y = math.Max(y, s.ymin)
		return s.y0 - (math.Log10(y)-math.Log10(s.ymin))/(math.Log10(s.ymax)-math.Log10(s.ymin))*(s.y0-s.y1)
	}
	return s.y0 - (y-s.ymin)/(s.ymax-s.ymin)*(s.y0-s.y1)
}

// scale returns the panel's scale: x spans the data, y goes from 0 (a
// power of ten below the smallest positive value with logY) to a round
// value above the largest. It reports false when the panel has no point.
func (p *chartPanel) scale() (panelScale, bool) {
	s := panelScale{left: 80, right: float64(chartWidth - 160), y0: float64(p.top + panelHeight), y1: float64(p.top + 20), logY: p.logY}
	s.xmin, s.xmax, s.ymin, s.ymax = math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, ser := range p.ss {
		for i := range ser.xs {
			s.xmin, s.xmax = math.Min(s.xmin, ser.xs[i]), math.Max(s.xmax, ser.xs[i])
			s.ymin, s.ymax = math.Min(s.ymin, ser.ys[i]), math.Max(s.ymax, ser.ys[i])
		}
	}
	if math.IsInf(s.xmin, 0) {
		return s, false
	}
	if s.xmax == s.xmin {
		s.xmax = s.xmin + 1
	}
	s.ymin = 0
	if p.logY {
		s.ymin = math.Max(1e-3, math.Pow(10, math.Floor(math.Log10(math.Max(1e-3, minPositive(p.ss))))))
		s.ymax = math.Pow(10, math.Ceil(math.Log10(math.Max(s.ymax, s.ymin*10))))
	} else {
		s.ymax = niceCeil(s.ymax)
	}
	return s, true
}

// write draws the panel into b: nothing when it has no point.
func (p *chartPanel) write(b *strings.Builder) {
	s, ok := p.scale()
	if !ok {
		return
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", int(s.left), p.top+10, p.title)
	fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", s.left, s.y1, s.right-s.left, s.y0-s.y1)
	p.writeAxes(b, &s)
	p.writeLines(b, &s)
}

// writeAxes draws the panel's y ticks (with grid lines), x ticks and the
// two axis labels.
func (p *chartPanel) writeAxes(b *strings.Builder, s *panelScale) {
	var yt []float64
	if p.logY {
		for v := s.ymin; v <= s.ymax*1.0001; v *= 10 {
			yt = append(yt, v)
		}
	} else {
		for i := range 5 {
			yt = append(yt, s.ymin+(s.ymax-s.ymin)*float64(i)/4)
		}
	}
	for _, v := range yt {
		fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			s.left, s.right, s.y(v), s.y(v), s.left-6, s.y(v)+4, humanNumber(v))
	}
	for _, x := range p.xticks {
		if x < s.xmin || x > s.xmax {
			continue
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", s.x(x), s.y0+16, p.xtickLabel(x))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`+"\n", (s.left+s.right)/2, s.y0+34, p.xlabel)
	fmt.Fprintf(b, `<text x="16" y="%.0f" transform="rotate(-90 16 %.0f)" text-anchor="middle">%s</text>`+"\n", (s.y0+s.y1)/2, (s.y0+s.y1)/2, p.ylabel)
}

// writeLines draws the panel's series, each a polyline (dashed after the
// first, so that equal lines stay visible), and their legend at the right.
func (p *chartPanel) writeLines(b *strings.Builder, s *panelScale) {
	for i, ser := range p.ss {
		c := chartColors[i%len(chartColors)]
		var pts []string
		for k := range ser.xs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", s.x(ser.xs[k]), s.y(ser.ys[k])))
		}
		dash := ""
		if i > 0 {
			dash = fmt.Sprintf(` stroke-dasharray="%d,4"`, 4+4*i)
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-opacity="0.85"%s points="%s"/>`+"\n", c, dash, strings.Join(pts, " "))
		fmt.Fprintf(b, `<rect x="%.0f" y="%d" width="12" height="12" fill="%s"/><text x="%.0f" y="%d">%s</text>`+"\n",
			s.right+12, p.top+24+i*18, c, s.right+30, p.top+34+i*18, ser.name)
	}
}

// nines maps a percentile to the number of nines (50% -> 0.3, 99% -> 2).
func nines(p float64) float64 { return -math.Log10(1 - p/100) }

// series is one line of a chart.
type series struct {
	name   string
	xs, ys []float64
}

func minPositive(ss []series) float64 {
	m := math.Inf(1)
	for _, s := range ss {
		for _, y := range s.ys {
			if y > 0 {
				m = math.Min(m, y)
			}
		}
	}
	if math.IsInf(m, 1) {
		return 1
	}
	return m
}

func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func humanNumber(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", math.Round(v/1e4)/100)
	case v >= 1e3:
		return fmt.Sprintf("%gk", math.Round(v/10)/100)
	case v >= 1:
		return fmt.Sprintf("%g", math.Round(v*100)/100)
	}
	return fmt.Sprintf("%g", v)
}
