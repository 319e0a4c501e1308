module trainjob.local/kind/pause

go 1.24.0
