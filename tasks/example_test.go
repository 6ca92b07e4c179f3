package tasks_test

import (
	"fmt"

	"github.com/fleetcap/fleetcap/tasks"
	"github.com/hibiken/asynq"
)

func ExampleNewReportFetchTask() {
	task, err := tasks.NewReportFetchTask(tasks.ReportFetchPayload{TenantID: "acme", Report: "monthly-usage"}, asynq.MaxRetry(10))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(task.Type(), string(task.Payload()))

	_, err = tasks.NewReportFetchTask(tasks.ReportFetchPayload{})
	fmt.Println(err)
	// Output:
	// report:fetch {"tenant_id":"acme","report":"monthly-usage"}
	// invalid report:fetch payload: tenant_id: required
}
