package config

// Validate fills the unset fields of a Config built in code with their
// defaults and checks it, as LoadConfig and ParseConfig do for a file
// (worker.New does the same). Every problem is reported, naming its field by
// YAML path.
func (c *Config) Validate() error {
	c.withDefaults(nil)
	return c.validate()
}
