module trainjob.local/workload

go 1.24.0
