from maze_server.cli import main

raise SystemExit(main())
