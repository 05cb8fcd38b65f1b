// device_query: the driver version and, per device, its identity and every
// attribute id. Device-dependent output: checked for shape, not content.
#include "common.h"

static const int ATTRIBUTE_IDS = 148; // CU_DEVICE_ATTRIBUTE_MAX in CUDA 13.0

int main() {
    CHECK(cuInit(0));
    int version, count;
    CHECK(cuDriverGetVersion(&version));
    printf("driver version: %d\n", version);
    CHECK(cuDeviceGetCount(&count));
    printf("devices: %d\n", count);

    for (int i = 0; i < count; i++) {
        CUdevice dev, again;
        CHECK(cuDeviceGet(&dev, i));
        char name[256], bus[64];
        CHECK(cuDeviceGetName(name, sizeof name, dev));
        printf("device %d: %s\n", i, name);
        CUuuid uuid;
        CHECK(cuDeviceGetUuid(&uuid, dev));
        printf("uuid: ");
        for (unsigned char b : uuid.bytes) printf("%02x", b);
        printf("\n");
        CHECK(cuDeviceGetPCIBusId(bus, sizeof bus, dev));
        CHECK(cuDeviceGetByPCIBusId(&again, bus));
        printf("pci bus id: %s, round trip: %s\n", bus, yes_no(again == dev));
        size_t total;
        CHECK(cuDeviceTotalMem(&total, dev));
        printf("total memory: %zu\n", total);
        int major, minor;
        CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
        CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
        printf("compute capability: %d.%d\n", major, minor);
        for (int a = 0; a < ATTRIBUTE_IDS; a++) {
            int v = 0;
            CUresult rc = cuDeviceGetAttribute(&v, (CUdevice_attribute)a, dev);
            printf("attr %d: rc=%d value=%d\n", a, (int)rc, v);
        }
    }

    int v = 0;
    CUresult rc = cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 99);
    printf("bad device 99: %s\n", err_name(rc));
    rc = cuDeviceGetAttribute(&v, (CUdevice_attribute)9999, 0);
    printf("bad attribute 9999: %s\n", err_name(rc));
    printf("done\n");
    return 0;
}
