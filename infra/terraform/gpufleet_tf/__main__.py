from gpufleet_tf.main import main

main()
