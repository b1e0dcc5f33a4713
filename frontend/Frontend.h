// The frontend: TorchScript archive + ganc spec -> ganc IR. One header for its users.
#pragma once

#include "frontend/Archive.h"
#include "frontend/JointLowering.h"
#include "frontend/Lowering.h"
#include "frontend/Shapes.h"
#include "frontend/Stages.h"
#include "frontend/SyncBatchNorm.h"
#include "support/torch/Dtypes.h"
