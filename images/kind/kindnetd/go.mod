module trainjob.local/kind/kindnetd

go 1.24.0
