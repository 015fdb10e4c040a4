KVLAB_THREADS=15 OMP_NUM_THREADS=15 CUDA_VISIBLE_DEVICES=0 dask worker tcp://127.0.0.1:8811 --nthreads 1 --resources GPU=1 --name vm-gpu0 &
KVLAB_THREADS=15 OMP_NUM_THREADS=15 CUDA_VISIBLE_DEVICES=1 dask worker tcp://127.0.0.1:8811 --nthreads 1 --resources GPU=1 --name vm-gpu1 &
wait
