// Holds all but KEEP_MIB of the card's free memory until killed: a card that another
// process nearly fills (a live server during a llama.cpp bump).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t keep = (size_t)atoll(argc > 1 ? argv[1] : "512") << 20, free_b, total_b;
    void *p;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || free_b <= keep) return 2;
    if (cudaMalloc(&p, free_b - keep) != cudaSuccess) return 3;
    cudaMemGetInfo(&free_b, &total_b);
    printf("holding; %zu MiB free\n", free_b >> 20);
    fflush(stdout);
    pause();
    return 0;
}
