package monitoring

import "slices"

// templateRows gathers the rows of one kind of key for GET /api/semaphores
// (Row is SemaphoreStatus or RateLimitStatus): the row of a plain key
// stands alone, while a template has one row that counts its rendered keys
// and lists the busiest of them beneath.
type templateRows[Row any, P templateRow[Row]] struct {
	plain     []Row            // the rows of plain keys
	templates map[string]P     // the row of each template
	order     []string         // the templates, in the order first met
	busy      map[string][]Row // the rows of each template's rendered keys in use
}

// templateRow is what templateRows needs of a row, through its pointer P.
type templateRow[Row any] interface {
	*Row
	// inUse reports whether a rendered key's row is worth listing beneath
	// its template.
	inUse() bool
	// count adds the row of one of the template's rendered keys to the
	// template's row.
	count(rendered Row)
	// setBusiest sets the rows listed beneath the template's row.
	setBusiest(rendered []Row)
}

// newTemplateRows returns an empty gathering of rows.
func newTemplateRows[Row any, P templateRow[Row]]() *templateRows[Row, P] {
	return &templateRows[Row, P]{templates: map[string]P{}, busy: map[string][]Row{}}
}

// setTemplate sets the row of the template name, in place of the one made
// for it before if any.
func (g *templateRows[Row, P]) setTemplate(name string, row Row) {
	if t, ok := g.templates[name]; ok {
		*t = row
		return
	}
	g.templates[name] = &row
	g.order = append(g.order, name)
}

// add adds the row of a key rendered from template, or of a plain key
// when template is "". newTemplate makes the template's row if the
// template has none yet.
func (g *templateRows[Row, P]) add(template string, row Row, newTemplate func() Row) {
	if template == "" {
		g.plain = append(g.plain, row)
		return
	}
	if _, ok := g.templates[template]; !ok {
		g.setTemplate(template, newTemplate())
	}
	g.templates[template].count(row)
	if P(&row).inUse() {
		g.busy[template] = append(g.busy[template], row)
	}
}

// sorted returns every row ordered by busiestFirst, each template's with
// the busiest of its rendered keys in use beneath, at most busiest of them.
func (g *templateRows[Row, P]) sorted(busiest int, busiestFirst func(a, b Row) int) []Row {
	rows := g.plain
	for _, name := range g.order {
		t := g.templates[name]
		busy := g.busy[name]
		slices.SortFunc(busy, busiestFirst)
		t.setBusiest(busy[:min(len(busy), busiest)])
		rows = append(rows, *t)
	}
	slices.SortStableFunc(rows, busiestFirst)
	return rows
}
