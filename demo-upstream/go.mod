module tollgate/demo-upstream

go 1.22
