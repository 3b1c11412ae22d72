module weft.example/istioctl-check

go 1.19
