package main

import (
	"testing"

	"github.com/dislock/dislock/internal/testenv"
)

// TestQuickstartMySQL runs the quick start on the MySQL / MariaDB of
// DISLOCK_TEST_MYSQL, in its default lock table.
func TestQuickstartMySQL(t *testing.T) {
	quickstartOn(t, "MYSQL_URL", testenv.MySQL(t), "MySQL")
}
