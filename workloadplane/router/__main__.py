from workloadplane.router.server import main

main()
